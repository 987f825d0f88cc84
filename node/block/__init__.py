"""The shared state block: its declared layout (`shared_state`), the protocol the roles use (`state_protocol`) and the in-memory block the simulator and unit tests use (`memory_state`)."""
