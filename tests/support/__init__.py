"""Test support code shared by the test suites (not tests themselves)."""
