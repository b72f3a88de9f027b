"""The shared-cluster social protocol: request, lock, look, announce, consent, grace, execute, report.

Transport-free: no chat types here. Adapters implement `Chat` and call the `Engine`.
"""
