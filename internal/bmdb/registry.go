package bmdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// registryArg is one condition parameter as the registry stores it: its
// type, so that the CLI and the status page rebuild the very value the
// daemons bind, and its text, readable by an operator (durations as Go
// writes them).
type registryArg struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// argsJSON renders the condition's parameters for the registry.
func argsJSON(c Candidates) []byte {
	out := map[string]registryArg{}
	for k, v := range c.Args() {
		out[k] = encodeArg(v)
	}
	b, err := json.Marshal(out)
	if err != nil { // a map of strings always marshals
		return []byte("{}")
	}
	return b
}

func encodeArg(v any) registryArg {
	switch v := v.(type) {
	case time.Duration:
		return registryArg{"duration", v.String()}
	case string:
		return registryArg{"string", v}
	case bool:
		return registryArg{"bool", strconv.FormatBool(v)}
	case int:
		return registryArg{"int", strconv.Itoa(v)}
	case int32:
		return registryArg{"int", strconv.FormatInt(int64(v), 10)}
	case int64:
		return registryArg{"int", strconv.FormatInt(v, 10)}
	case float64:
		return registryArg{"float", strconv.FormatFloat(v, 'g', -1, 64)}
	case time.Time:
		return registryArg{"time", v.UTC().Format(time.RFC3339Nano)}
	default:
		return registryArg{fmt.Sprintf("%T", v), fmt.Sprint(v)}
	}
}

func decodeArg(a registryArg) (any, error) {
	switch a.Type {
	case "duration":
		return time.ParseDuration(a.Value)
	case "string":
		return a.Value, nil
	case "bool":
		return strconv.ParseBool(a.Value)
	case "int":
		return strconv.ParseInt(a.Value, 10, 64)
	case "float":
		return strconv.ParseFloat(a.Value, 64)
	case "time":
		return time.Parse(time.RFC3339Nano, a.Value)
	default:
		return nil, fmt.Errorf("a value of Go type %s, which the registry records as text only", a.Type)
	}
}

// decodeArgs reads the registry's parameters; a parameter of a type it
// cannot carry makes the condition unusable, said by the error.
func decodeArgs(raw []byte) (pgx.NamedArgs, map[string]string, error) {
	var stored map[string]registryArg
	if err := json.Unmarshal(raw, &stored); err != nil {
		return nil, nil, fmt.Errorf("reading the recorded parameters: %w", err)
	}
	args := make(pgx.NamedArgs, len(stored))
	text := make(map[string]string, len(stored))
	for k, a := range stored {
		text[k] = a.Value
		v, err := decodeArg(a)
		if err != nil {
			return nil, text, fmt.Errorf("parameter @%s: %w", k, err)
		}
		args[k] = v
	}
	return args, text, nil
}

// ErrNotRegistered is returned for a process that is not registered:
// by RegisteredCondition when no runner has registered it in the BMDB
// (there is no recorded condition to evaluate), and by a claim for a
// process that this DB has not registered with the claim's condition, or
// whose registration is gone from the BMDB (RegisterProcess).
var ErrNotRegistered = errors.New("process not registered")

// RegisteredCondition is a process's condition as the BMDB recorded it,
// and what the live replicas running it say.
//
// Its SQL is data, not code: whoever can write process_registry can put
// any text there, and a tool runs its statements with the operator's
// role. So nothing here runs it: Candidates evaluates the condition
// compiled into the caller, with the recorded parameters (bound as
// values), and only when the recorded text is the caller's own.
type RegisteredCondition struct {
	// Name, SQL and Due are the condition's text as recorded (Due ""
	// when time alone never makes it true), to compare and to show,
	// escaped: never to run.
	Name, SQL, Due string
	// Args are the recorded parameters as text, for operators.
	Args map[string]string
	// args are the recorded parameters as the daemons bind them;
	// argsErr says why they could not be read.
	args    pgx.NamedArgs
	argsErr error
	// By and At say which runner registered it last, and when.
	By string
	At time.Time
	// Fingerprint identifies the condition with its parameters.
	Fingerprint string
	// DueBuilt is false while the process's due rows are being built from
	// this condition, or when a build stopped (the next registration
	// continues it): until then claims see only the machines of the
	// chunks built so far and those that writes made due since.
	DueBuilt bool
	// Registrants are the live sessions running the process, each with
	// its own parameters; Disagree is set when they are not all the
	// recorded condition.
	Registrants []Registrant
	Disagree    bool
}

// ErrConditionDiffers is returned by RegisteredCondition.Candidates when
// the condition recorded in the BMDB is not the caller's own: another
// release registered it, or the row was changed in the database.
var ErrConditionDiffers = errors.New("the condition recorded in the BMDB differs from this binary's")

// Candidates is own, the caller's compiled-in condition of the process,
// bound to the recorded parameters: eligibility as the daemons evaluate
// it, running only SQL of the caller's binary. It fails with
// ErrConditionDiffers when the recorded name, SQL or due time is not
// own's, or the recorded parameters are not own's parameters; and with a
// descriptive error when a recorded parameter has a type the registry
// cannot carry.
func (rc RegisteredCondition) Candidates(own Candidates) (Candidates, error) {
	switch {
	case rc.Name != own.Name():
		return Candidates{}, fmt.Errorf("%w: it is named %q, this binary's %q", ErrConditionDiffers, rc.Name, own.Name())
	case rc.SQL != own.SQL():
		return Candidates{}, fmt.Errorf("%w: its SQL text is not this binary's", ErrConditionDiffers)
	case rc.Due != own.Due():
		return Candidates{}, fmt.Errorf("%w: its due time's SQL text is not this binary's", ErrConditionDiffers)
	case rc.argsErr != nil:
		return Candidates{}, rc.argsErr
	}
	recorded := slices.Sorted(maps.Keys(rc.args))
	ownArgs := slices.Sorted(maps.Keys(maps.Collect(own.Args())))
	if !slices.Equal(recorded, ownArgs) {
		return Candidates{}, fmt.Errorf("%w: its parameters are %s, this binary's %s", ErrConditionDiffers, strings.Join(recorded, ", "), strings.Join(ownArgs, ", "))
	}
	// own passed NewCandidates with these names: binding other values
	// to them cannot fail.
	return NewCandidates(Condition{Name: own.Name(), SQL: own.SQL(), Due: own.Due(), Args: maps.Clone(rc.args)})
}

// Registrant is one live session's view of a process's condition.
type Registrant struct {
	Session      uuid.UUID
	RuntimeInfo  string
	Fingerprint  string
	Args         map[string]string
	RegisteredAt time.Time
}

// ArgsText renders recorded parameters as name=value pairs, sorted.
func ArgsText(args map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(args)) {
		parts = append(parts, k+"="+args[k])
	}
	return strings.Join(parts, " ")
}

// RegisteredCondition reads the condition process was last registered
// with, and its live registrants. Tools use it so that they evaluate what
// the running daemons evaluate, not their own defaults; they evaluate it
// through Candidates. It fails with ErrNotRegistered when no runner has
// registered the process.
func (db *DB) RegisteredCondition(ctx context.Context, process Process) (RegisteredCondition, error) {
	var (
		rc          RegisteredCondition
		rawArgs     []byte
		registrants []Registrant
	)
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		registrants = registrants[:0]
		err := tx.tx.QueryRow(ctx, qRegistryCondition, process.Name).Scan(&rc.Name, &rc.SQL, &rc.Due, &rawArgs, &rc.Fingerprint, &rc.By, &rc.At, &rc.DueBuilt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w in the BMDB (no runner of it has started against this database)", ErrNotRegistered)
		}
		if err != nil {
			return err
		}
		rows, err := tx.tx.Query(ctx, qRegistrants, process.Name)
		if err != nil {
			return err
		}
		for rows.Next() {
			var r Registrant
			var raw []byte
			if err := rows.Scan(&r.Session, &r.RuntimeInfo, &r.Fingerprint, &raw, &r.RegisteredAt); err != nil {
				rows.Close()
				return err
			}
			_, r.Args, _ = decodeArgs(raw)
			registrants = append(registrants, r)
		}
		return rows.Err()
	})
	if err != nil {
		return RegisteredCondition{}, fmt.Errorf("reading the registered condition of %s: %w", process.Name, err)
	}
	rc.Registrants = registrants
	for _, r := range registrants {
		if r.Fingerprint != rc.Fingerprint {
			rc.Disagree = true
		}
	}
	rc.args, rc.Args, rc.argsErr = decodeArgs(rawArgs)
	if rc.argsErr != nil {
		rc.argsErr = fmt.Errorf("the registered condition of %s (%s): %w", process.Name, rc.Name, rc.argsErr)
	}
	if rc.Due == noDue {
		rc.Due = ""
	}
	return rc, nil
}

// RecordCandidates records the session's view of process's condition, so
// that tools can tell when the replicas running process disagree, with
// this binary's schema version (so that tools can tell sessions of older
// binaries, which record none) and the process's per-machine budget from
// limits (which the database applies to leases that older binaries take,
// and history retention keeps the events of). The row lives as long as
// the session.
func (s *Session) RecordCandidates(ctx context.Context, process Process, candidates Candidates, limits Limits) error {
	var n *int32
	var window *float64
	if b := limits.MachineBudget; b.Set() {
		n32, secs := int32(min(b.N, math.MaxInt32)), b.Window.Seconds()
		n, window = &n32, &secs
	}
	err := s.db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		_, err := tx.tx.Exec(ctx, qRegistrantUpsert, process.Name, s.id, fingerprint(candidates, process), argsJSON(candidates),
			int32(LatestVersion()), n, window)
		return err
	})
	if err != nil {
		return fmt.Errorf("recording the condition of %s for session %s: %w", process.Name, s.id, err)
	}
	return nil
}
