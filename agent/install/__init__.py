"""Installers and fetchers: bringing a package onto the disk (downloads, safe extraction,
virtualenvs) and the file-system helpers they share. Imports only the core."""
