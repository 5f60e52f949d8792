"""What a deployment's view shows: the honest status, the live status, the last hour's history."""
