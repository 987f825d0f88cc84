"""The deterministic simulator of a DLedger group running the real role code (docs/testing.md)."""
