"""How a node's processes and sockets are wired: the declared in-node channels and ports, the listeners, the test-only fault hooks."""
