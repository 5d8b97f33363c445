"""The thin module every service shares: on-disk layout, tokens, errors, logging.

Services talk to each other only through protos/; what is here is the little
that must agree between them without a call (where a node keeps its files, how
a data-plane token is signed, how an error is named on the wire).
"""
