"""Operations: one agent process (its lifecycle, start-up checks, signals, parent watch), its
command line and settings sources, logging and systemd readiness."""
