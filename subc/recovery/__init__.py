"""Delivery that survives loss: the journal of every subscriber's stream (:mod:`.journal`), from
which MoldUDP64 re-requests and SoupBinTCP logins are served (issue 40)."""
