"""index for counting an owner's active sweeps

Revision ID: 0004
Revises: 0003

``POST /sweeps`` counts the owner's queued and running sweeps (the per-owner cap). With only
``ix_sweeps_owner`` SQLite read every sweep row of the owner to check its state, and a sweep row
holds its spec and report (tens of KiB, in overflow pages): 0.8 ms per count over 1,000 sweeps.
On (owner, state) the count is answered from the index alone.
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sweeps_owner_state", "sweeps", ["owner", "state"])


def downgrade() -> None:
    op.drop_index("ix_sweeps_owner_state", table_name="sweeps")
