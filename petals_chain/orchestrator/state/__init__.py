"""What the orchestrator knows and keeps: ``registry`` (the servers, their figures and assignments), ``store`` (the
SQLite file behind --state-dir) and ``persist`` (journalling into it and restoring from it after a restart).
"""
