"""Text from outside, handled as untrusted: read (`jsonlines`: bounded lines, linear time), fetched
(`outgoing`: http requests that follow no redirect) and shown (`escape`: terminal and Slack text inert).
The dashboard's markdown and HTML escaping is `tracker.dashboard.escape`'s."""
