"""packfmt on Ray (optional extra ``packfmt[ray]``; nothing else in packfmt imports this package).

* ``packfmt.ray.build.run_ray_build``: ``packfmt build ... --engine ray`` (a collection written by
  a Ray Data job: tokenizer actors, one member store per write task, a driver-side commit).
"""
