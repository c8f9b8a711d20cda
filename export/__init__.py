"""What specguard can hand to the Prometheus stack it sits beside.

``prometheus_rules`` turns specguard's rules into a Prometheus alerting-rule file, for a site that
wants Prometheus to evaluate the same conditions (and Alertmanager to route them); ``conversion``
turns one rule, ``scopes`` splits its series by baseline entry, ``go_templates`` translates its
annotations. ``alertmanager`` writes the Alertmanager configuration that delivers alerts to
specguard's webhook receiver. Both return text and warnings; the command line decides where they go.
"""
