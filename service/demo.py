"""``make demo``: a short demonstration of the objective family on synthetic surprisal.

(The service issue turns this into the full REST demo.)
"""

from service.objectives_demo import print_demo, print_registry

if __name__ == "__main__":
    print_registry()
    print_demo()
