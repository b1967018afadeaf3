#!/usr/bin/env bash
# Run a command with a PostgreSQL server for the store tests (they run on SQLite and PostgreSQL and
# FAIL without a server). Uses TURNWIRE_TEST_POSTGRES_URL when set, else the server on
# 127.0.0.1:5432 when one listens (the tests' default); otherwise starts a throwaway one: initdb
# into a temporary folder, pg_ctl on a free port with trust auth, stopped and deleted when the
# command ends. (CI_POSTGRES_CHECK_PORT changes the port looked at, to try the throwaway path on
# a machine that has a server on 5432.)
#
#     bash tools/with-postgres.sh .venv/bin/python -m pytest -q
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_throwaway_postgres() {
    local dir port
    local -a as_owner=()
    if ! command -v initdb >/dev/null || ! command -v pg_ctl >/dev/null; then
        echo "tools/with-postgres.sh: no PostgreSQL listens on 127.0.0.1:5432 and initdb/pg_ctl are not on" \
            "the PATH: install PostgreSQL, or set TURNWIRE_TEST_POSTGRES_URL=postgresql://user@host:port/db" >&2
        exit 2
    fi
    dir="$(mktemp -d "${TMPDIR:-/tmp}/turnwire-postgres.XXXXXX")"
    if [[ "$(id -u)" == 0 ]]; then  # initdb and postgres refuse to run as root
        chown postgres "$dir"
        as_owner=(runuser -u postgres --)
    fi
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    ${as_owner[@]+"${as_owner[@]}"} initdb -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log"
    ${as_owner[@]+"${as_owner[@]}"} pg_ctl -D "$dir/data" -l "$dir/server.log" -w -s \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start
    # shellcheck disable=SC2064  # expand now: the values are this function's locals
    trap "${as_owner[*]} pg_ctl -D '$dir/data' -m fast -w -s stop; rm -rf '$dir'" EXIT
    export TURNWIRE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/postgres"
    echo "started a throwaway PostgreSQL for the tests: $TURNWIRE_TEST_POSTGRES_URL"
}

if [[ -z "${TURNWIRE_TEST_POSTGRES_URL:-}" ]] && ! listening "${CI_POSTGRES_CHECK_PORT:-5432}"; then
    start_throwaway_postgres
fi
"$@"
