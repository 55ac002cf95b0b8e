"""Widget viewers over the DataFrame API."""
