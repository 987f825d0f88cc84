"""What a node holds on its machine: the store directory's member lock and the run directories of its roles."""
