"""Reports: text, HTML and console lines rendered from stage results."""
