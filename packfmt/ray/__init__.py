"""packfmt on Ray (optional extra ``packfmt[ray]``; nothing else in packfmt imports this package).

* ``packfmt.ray.build.run_ray_build``: ``packfmt build ... --engine ray`` (a collection written by
  a Ray Data job: tokenizer actors, one member store per write task, a driver-side commit).
* ``packfmt.ray.datasource.read_packs``: one epoch of a pack index as a Ray Dataset whose rows are
  ``PackedDataset``'s items, dealt over ``num_replicas`` as ``DistributedPackSampler`` deals them
  (so Ray Train's ``streaming_split(n, equal=True)`` gives every worker the same count and drops
  nothing), images run through an image processor in CPU actors.
"""
