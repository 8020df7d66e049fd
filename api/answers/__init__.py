"""The service's answers: the decisions, over the rows the store reads."""
