"""The application: the agent's settings and its operations (create, delete, info), free of
any protocol. The doors call it; it calls the state and the core."""
