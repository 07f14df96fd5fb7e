"""Stages: compile, graph map, dump, compare, precision assignment; each reads and writes files."""
