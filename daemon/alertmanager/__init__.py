"""Alertmanager's webhook: the payload, the receiver in front of the store, and the alerts it keeps.

A delivery is authenticated, validated, deduplicated and stored before it is answered (200: stored;
5xx: Alertmanager retries; 4xx: it drops the delivery). Stored alerts then drive alert rules and
trigger immediate evaluations of signal rules that name them, through the same engine, dispatcher
and store as the schedule.
"""
