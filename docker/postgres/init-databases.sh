#!/usr/bin/env bash
# Postgres runs this once, on an empty data directory (/docker-entrypoint-initdb.d): one role and
# one database for MLflow's backend store, one for the kappa-sweep service's store. Changing the
# names or passwords later needs `docker compose down -v` (which deletes both databases) or an
# ALTER ROLE by hand.
#
# The official entrypoint executes this file, or sources it when the checkout lost its
# executable bit, so it sets no shell options of its own.

create_database() {
    # psql variables (:"name" and :'value') quote the names and the password properly.
    psql --set=ON_ERROR_STOP=1 --username="$POSTGRES_USER" --dbname=postgres \
        --set=role="$1" --set=password="$2" --set=database="$3" <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'password';
CREATE DATABASE :"database" OWNER :"role";
SQL
}

create_database "${MLFLOW_DB_USER:?}" "${MLFLOW_DB_PASSWORD:?}" "${MLFLOW_DB_NAME:?}" || exit 1
create_database "${SERVICE_DB_USER:?}" "${SERVICE_DB_PASSWORD:?}" "${SERVICE_DB_NAME:?}" || exit 1
