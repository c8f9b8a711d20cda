"""``specguard diagnose``: the playbook's four troubleshooting cases, each answered with a verdict,
the numbers it rests on and the remedy."""
