"""What a job shows: its history and view (`nopstream status`, GET /api/v1/job), its metrics and the
dashboard's files."""
