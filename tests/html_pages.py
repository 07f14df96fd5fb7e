"""The published HTML pages as a test reads them: their ids, links, header and config block, and a check
that every link of a page resolves."""

from html.parser import HTMLParser


class Page(HTMLParser):
    """A page's ids and links, the text of its header, and the config block in it."""

    def __init__(self, text):
        super().__init__()
        self.ids, self.links, self.header, self.config, self._open = [], [], "", "", set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids += [attrs["id"]] if "id" in attrs else []
        self.links += [attrs["href"]] if "href" in attrs else []
        self._open.add(tag)

    def handle_endtag(self, tag):
        self._open.discard(tag)

    def handle_data(self, data):
        if "header" in self._open:
            self.header += data
            self.config += data if "pre" in self._open else ""


def assert_links_resolve(path):
    """Every link of the page at `path` names an existing file beside it, and every #id an element of the
    page it opens (a chart point's or a graph node's row). The page, parsed."""
    page = Page(path.read_text())
    for link in page.links:
        file, _, anchor = link.partition("#")
        target = path.parent / file if file else path
        assert target.is_file(), link
        assert not anchor or anchor in (Page(target.read_text()).ids if file else page.ids), link
    return page
