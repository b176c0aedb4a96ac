"""Fetching: a package named by a URI brought into a local file, each scheme one module (the
table of them: ``fetcher``), and the sources and HTTP transport they read through."""
