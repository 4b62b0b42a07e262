"""Reference semantics: the decision of a rule set for one message (stateless and with state) and the
delivery of a datagram's messages to recipients.
"""
