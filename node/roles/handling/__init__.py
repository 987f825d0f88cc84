"""The handler's parts, one job per module, composed by `node.roles.handler.Handler` (its
module docstring has the map). Each part holds the handler and reaches the store, the block,
the cores and the other parts through it: the simulator replaces the store, the lock, the
transport and the state-machine link after construction, so nothing is captured earlier."""
