"""Host code and references that several families share."""
