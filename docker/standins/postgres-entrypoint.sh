#!/bin/sh
# The stand-in Postgres (docker/standins/Dockerfile), doing what the official image's entrypoint
# does for this stack: on an empty data directory, initdb with POSTGRES_USER / POSTGRES_PASSWORD
# (UTF8: with SQL_ASCII psycopg 3 hands back bytes) and run /docker-entrypoint-initdb.d/*.sh
# against a server on its Unix socket only; then run the server on TCP.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"
as_postgres() { runuser -u postgres -- env PATH="$PATH" PGDATA="$PGDATA" "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s' "${POSTGRES_PASSWORD:?}" > /tmp/pwfile
    chown postgres /tmp/pwfile
    as_postgres initdb --username="${POSTGRES_USER:-postgres}" --pwfile=/tmp/pwfile \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f /tmp/pwfile
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl --wait --options="-c listen_addresses=''" start >/dev/null
    for script in /docker-entrypoint-initdb.d/*.sh; do
        [ -e "$script" ] || continue
        echo "standin-postgres: running $script"
        as_postgres env POSTGRES_USER="${POSTGRES_USER:-postgres}" \
            MLFLOW_DB_NAME="${MLFLOW_DB_NAME:-}" MLFLOW_DB_USER="${MLFLOW_DB_USER:-}" \
            MLFLOW_DB_PASSWORD="${MLFLOW_DB_PASSWORD:-}" SERVICE_DB_NAME="${SERVICE_DB_NAME:-}" \
            SERVICE_DB_USER="${SERVICE_DB_USER:-}" SERVICE_DB_PASSWORD="${SERVICE_DB_PASSWORD:-}" \
            bash "$script"
    done
    as_postgres pg_ctl --wait --mode=fast stop >/dev/null
fi
exec runuser -u postgres -- env PATH="$PATH" postgres -D "$PGDATA" -c listen_addresses='*'
