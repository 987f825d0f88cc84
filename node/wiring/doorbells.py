"""The node's doorbells: the mechanism lives in `ipc.doorbells` (a local client rings one too,
and the client library imports nothing of `node`); re-exported here for the roles."""

from ipc.doorbells import Doorbell, DoorbellError, bell_path

__all__ = ["Doorbell", "DoorbellError", "bell_path"]
