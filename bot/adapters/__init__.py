"""Chat adapters: each turns one chat system's events into engine calls and renders what it returns."""
