"""The disk: the agent's root (where a package lives, how big things are, how much room is
left), the staging folder's steps around an install, and the modes of what the agent keeps."""
