"""Capture layer: sees torch API calls (function mode), modules (global hooks), aten ops (dispatch mode)."""
