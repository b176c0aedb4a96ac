"""The front doors: each converts a protocol (gRPC; Prometheus over HTTP) to and from the
application's calls and maps error kinds to its own codes. Glue only."""
