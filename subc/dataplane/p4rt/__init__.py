"""P4Runtime control plane: the WriteRequests that install a generation's entries on a switch
(:mod:`.requests`), built from ``entries.json`` and the program's P4Info."""
