"""``clip-gateway bulk``: embed a collection that outgrows one machine on Ray, through a fleet
of gateways, resumably and exactly once (docs/BULK.md). The bulk extra; never imported
by the server."""
