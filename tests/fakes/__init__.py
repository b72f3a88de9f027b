"""In-process fakes of external services for the tests."""
