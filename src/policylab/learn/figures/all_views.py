"""Every view module, imported so that `model.VIEWS` holds every view a figure definition
or an overlay may name (each module registers its views with `@view("name")`)."""

import policylab.learn.figures.views_advantages  # noqa: F401  (imported for its registrations, as below)
import policylab.learn.figures.views_corrections  # noqa: F401
import policylab.learn.figures.views_geometry  # noqa: F401
import policylab.learn.figures.views_mixed  # noqa: F401
import policylab.learn.figures.views_objectives  # noqa: F401
import policylab.learn.figures.views_pipelines  # noqa: F401
import policylab.learn.figures.views_rewards  # noqa: F401
import policylab.learn.figures.views_rich_rewards  # noqa: F401
import policylab.learn.figures.views_sequence  # noqa: F401
import policylab.learn.figures.views_testtime  # noqa: F401
