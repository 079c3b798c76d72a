"""a sweep's extensions

Revision ID: 0005
Revises: 0004

A sweep grows (``POST /sweeps/{id}/extend``): its ``spec`` becomes the union of its axes and
each extension is recorded in ``extensions`` (what it added, after which report, its
Idempotency-Key). ``extension_count`` is the number of records: the API appends one only
where it still holds the count it read, and a driver ends the sweep only while it does, so an
extension that lands as the sweep ends is never lost. Existing sweeps get none and 0.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("extensions", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("extension_count", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("extension_count")
        batch.drop_column("extensions")
