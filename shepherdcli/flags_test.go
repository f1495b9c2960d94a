package shepherdcli

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// runShepherd runs the binary to completion and returns its exit status,
// stdout and stderr.
func runShepherd(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(shepherdBinary, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("running shepherd %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestBadFlags checks that every command line that cannot work exits with
// status 2 and one line on stderr that names the problem, before touching
// any database.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	// A DSN that parses but names nothing: the checks must come first.
	const dsn = "postgres://shepherd:s3cret@127.0.0.1:1/nowhere"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-agentstart_backoff_exponent=0.5"}, "shepherd: -agentstart_backoff_exponent 0.5: must be at least 1"},
		{[]string{"-recovery_backoff_exponent=0"}, "shepherd: -recovery_backoff_exponent 0: must be at least 1"},
		{[]string{"-recovery_backoff_initial=1m", "-recovery_backoff_maximum=30s"}, "shepherd: -recovery_backoff_maximum 30s: must not be below -recovery_backoff_initial 1m0s"},
		{[]string{"-agentstart_backoff_maximum=1m"}, "shepherd: -agentstart_backoff_maximum 1m0s: must not be below -agentstart_backoff_initial 5m0s"},
		{[]string{"-agentstart_backoff_initial=500ms"}, "shepherd: -agentstart_backoff_initial 500ms: must be at least 1s"},
		{[]string{"-agentstart_loop_parallelism=0"}, "shepherd: -agentstart_loop_parallelism 0: must be at least 1"},
		{[]string{"-recovery_loop_parallelism=-3"}, "shepherd: -recovery_loop_parallelism -3: must be at least 1"},
		{[]string{"-recovery_db_query_rate=fast"}, `shepherd: invalid value "fast" for flag -recovery_db_query_rate: rate "fast": want interval,burst (e.g. 250ms,8)`},
		{[]string{"-agentstart_db_query_rate=250ms,0"}, `shepherd: invalid value "250ms,0" for flag -agentstart_db_query_rate: rate "250ms,0": burst must be at least 1`},
		{[]string{"-recovery_machine_budget=3"}, `shepherd: invalid value "3" for flag -recovery_machine_budget: machine budget "3": want N/DURATION (e.g. 3/24h), or none`},
		{[]string{"-agentstart_machine_budget=0/1h"}, `machine budget "0/1h": N must be a whole number of at least 1`},
		{[]string{"-agentstart_db_query_rate=soon,8"}, `invalid value "soon,8" for flag -agentstart_db_query_rate: rate "soon,8": interval:`},
		{[]string{"-processes=agentstart,reboot"}, `shepherd: -processes "agentstart,reboot": unknown process "reboot" (known: agentstart, recovery)`},
		{[]string{"-processes="}, `shepherd: -processes "": name at least one process (known: agentstart, recovery)`},
		{[]string{"-provider=maas"}, `shepherd: -provider "maas": unknown provider (known: sim, static)`},
		{[]string{"-sim_agent_start_failure_rate=1.5"}, "shepherd: -sim_agent_start_failure_rate 1.5: must be between 0 and 1"},
		{[]string{"-sim_heartbeat_loss_rate=-0.1"}, "shepherd: -sim_heartbeat_loss_rate -0.1: must be between 0 and 1"},
		{[]string{"-recovery_heartbeat_timeout=0s"}, "shepherd: -recovery_heartbeat_timeout 0s: must be positive"},
		{[]string{"-recovery_verify_timeout=0s"}, "shepherd: -recovery_verify_timeout 0s: must be positive"},
		{[]string{"-shutdown_grace=-1s"}, "shepherd: -shutdown_grace -1s: must not be negative"},
		{[]string{"-session_interval=100ms"}, "shepherd: -session_interval 100ms: must be between 1s and 1h"},
		{[]string{"-bmdb_dsn=postgres://u:pw@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"}, "shepherd: -bmdb_dsn: a TLS file the DSN names cannot be read: open /nonexistent/ca.pem: no such file or directory"},
		{[]string{"-session_interval=1200h"}, "shepherd: -session_interval 1200h0m0s: must be between 1s and 1h"},
		{[]string{"-shutdown_grace=100h"}, "shepherd: -shutdown_grace 100h0m0s: must be at most 1h"},
		{[]string{"-shutdown_grace=40s", "-graceful_shutdown_timeout=30s"}, "shepherd: -graceful_shutdown_timeout 30s: must be longer than -shutdown_grace (40s), which is part of the stop, and at most 2h"},
		{[]string{"-graceful_shutdown_timeout=0s"}, "shepherd: -graceful_shutdown_timeout 0s: must be longer than -shutdown_grace (10s), which is part of the stop, and at most 2h"},
		{[]string{"-agentstart_loop_parallelism=2147483647"}, "shepherd: -agentstart_loop_parallelism 2147483647: must be at most 4096"},
		{[]string{"-recovery_idle_poll=2h"}, "shepherd: -recovery_idle_poll 2h0m0s: must be at most 1h"},
		{[]string{"-recovery_safety_poll=0s"}, "shepherd: -recovery_safety_poll 0s: must be positive and at most 1h"},
		{[]string{"-log_format=xml"}, `shepherd: -log_format "xml": want text or json`},
		{[]string{"-agentstart_reconcile_interval=10s"}, "shepherd: -agentstart_reconcile_interval 10s: must be 0 (off) or between 1m and 168h"},
		{[]string{"-recovery_backoff_maximum=10000h"}, "shepherd: -recovery_backoff_maximum 10000h0m0s: must be at most 2160h0m0s"},
		{[]string{"-recovery_backoff_exponent=1000"}, "shepherd: -recovery_backoff_exponent 1000: must be at most 100"},
		{[]string{"-agent_refusals_per_second=0"}, "shepherd: -agent_refusals_per_second 0: must be above 0 and at most 1000000"},
		{[]string{"-agent_refusals_burst=0"}, "shepherd: -agent_refusals_burst 0: must be between 1 and 1000000"},
		{[]string{"-agent_max_conns=0"}, "shepherd: -agent_max_conns 0: must be between 1 and 1000000"},
		{[]string{"-agent_max_conns=100", "-agent_max_conns_per_source=101"}, "shepherd: -agent_max_conns_per_source 101: must be between 1 and -agent_max_conns (100)"},
		{[]string{"-agent_idle_timeout=500ms"}, "shepherd: -agent_idle_timeout 500ms: must be between 1s and 1h"},
		{[]string{"-history_retention=10m"}, "shepherd: -history_retention 10m0s: must be at least 1h0m0s (or 0 to keep history forever): history is the audit trail of running work"},
		{[]string{"-history_prune_interval=0s"}, "shepherd: -history_prune_interval 0s: must be positive"},
		{[]string{"-agentstart_loop_parallelism=many"}, `shepherd: invalid value "many" for flag -agentstart_loop_parallelism: parse error`},
		{[]string{"-no_such_flag"}, "shepherd: flag provided but not defined: -no_such_flag"},
		{[]string{"-bmdb_dsn=postgres://shepherd:s3cret@db:notaport/x"}, "shepherd: -bmdb_dsn: not a valid PostgreSQL URL or key=value DSN"},
		{[]string{"-bmdb_dsn=" + dsn, "-bmdb_dsn_file=/dev/null"}, "shepherd: -bmdb_dsn and -bmdb_dsn_file: give only one"},
		{[]string{"-bmdb_dsn_file=/nonexistent/dsn"}, "shepherd: -bmdb_dsn_file: open /nonexistent/dsn: no such file or directory"},
		{[]string{"sideways"}, `shepherd: unexpected argument "sideways" (subcommands: run, migrate)`},
		{[]string{"run", "-bmdb_dsn=" + dsn, "-agentstart_loop_parallelism=0"}, "shepherd: -agentstart_loop_parallelism 0: must be at least 1"},
		{[]string{"migrate"}, "shepherd: migrate: want an action: up, down, version or force N"},
		{[]string{"migrate", "sideways", "-bmdb_dsn=" + dsn}, `shepherd: migrate: unknown action "sideways": want up, down, version or force N`},
		{[]string{"migrate", "up"}, "shepherd: migrate: no database: give -bmdb_dsn, -bmdb_dsn_file or $SHEPHERD_BMDB_DSN"},
		{[]string{"migrate", "up", "now", "-bmdb_dsn=" + dsn}, `shepherd: migrate up: unexpected argument "now"`},
		{[]string{"migrate", "down", "-bmdb_dsn=" + dsn}, "shepherd: migrate down drops every Shepherd table and all fleet data (machines, leases, backoffs, history); add -yes to confirm"},
		{[]string{"migrate", "force", "-bmdb_dsn=" + dsn}, "shepherd: migrate force: want the version to record"},
		{[]string{"migrate", "force", "latest", "-bmdb_dsn=" + dsn}, `shepherd: migrate force "latest": want a schema version (a whole number)`},
		{[]string{"migrate", "force", "9999", "-bmdb_dsn=" + dsn}, "shepherd: migrate force 9999: this binary knows schema versions up to"},
	} {
		t.Run(strings.ReplaceAll(strings.Join(c.args, " "), dsn, "$DSN"), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), c.args...)
			if code != exitUsage {
				t.Errorf("exit status %d, want %d", code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
				t.Errorf("stderr is not one line:\n%s", stderr)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q, want it to contain %q", stderr, c.want)
			}
			if strings.Contains(stderr, "s3cret") {
				t.Errorf("stderr %q shows the DSN's password", stderr)
			}
		})
	}
}

// TestHelp checks that -h prints the usage on stdout and exits 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"Usage: shepherd [run] [flags]", "-agentstart_loop_parallelism", "-recovery_backoff_exponent", "-sim_machines", "-bmdb_dsn", "-v value"}},
		{[]string{"run", "-help"}, []string{"Usage: shepherd [run] [flags]"}},
		{[]string{"migrate", "-h"}, []string{"Usage: shepherd migrate", "-yes"}},
		{[]string{"help"}, []string{"shepherd migrate [flags] up|down|version|force N"}},
	} {
		code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), c.args...)
		if code != 0 || stderr != "" {
			t.Errorf("shepherd %v: exit status %d, stderr %q; want 0 and nothing", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("shepherd %v: usage lacks %q", c.args, w)
			}
		}
	}
}
