"""Message-format specs: the model (headers, query fields, parser), the P4_16 and P4_14 front ends with
the @pragma query_* annotations, and the parse graph.
"""
