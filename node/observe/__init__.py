"""The node's observability: metrics and their exposition, histograms, request counts, per-role metric words, the status trailer, the log format."""
