"""index for listing sweeps newest first

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sweeps_created_id", "sweeps", [sa.text("created_at DESC"), "id"])


def downgrade() -> None:
    op.drop_index("ix_sweeps_created_id", table_name="sweeps")
