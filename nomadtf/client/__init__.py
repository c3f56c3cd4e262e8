"""What a user's command does against a cluster (the admission wait today; run, follow and
the status read-back move here next). Nothing here prints."""
