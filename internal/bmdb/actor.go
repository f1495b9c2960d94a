package bmdb

// Who acts and why: the actor that operator actions and escalations
// record, the checks of their arguments, and a process's machine budget,
// which claims apply and the operator package reports.

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ActorFrom returns the actor WithActor put in ctx (zero when none).
func ActorFrom(ctx context.Context) Actor {
	a, _ := ctx.Value(actorKey{}).(Actor)
	return a
}

// Escalation is a machine a claim found over its process's budget, held
// and recorded Escalated instead of leased.
type Escalation struct {
	Machine    uuid.UUID
	ProviderID string
	Process    string
	Budget     MachineBudget
}

// ActorArg is the name to record, NULL when none was given.
func ActorArg(a Actor) *string {
	if a.Name == "" {
		return nil
	}
	return &a.Name
}

// budgetArgs sets the claim's parameters of the budget.
func budgetArgs(b MachineBudget, named pgx.NamedArgs) {
	if !b.Set() {
		named["budget"], named["budget_window"], named["budget_text"] = 0, float64(0), ""
		return
	}
	named["budget"], named["budget_window"], named["budget_text"] = b.N, b.Window.Seconds(), b.Window.String()
}

type actorKey struct{}

// WithActor returns ctx carrying actor, which the operator actions that take
// no Actor argument (Retry, ClearBackoff) record on their history events.
func WithActor(ctx context.Context, actor Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// CheckProcessName validates a process name given by an operator, so that a
// typo is an error instead of a pause nobody honours.
func CheckProcessName(name string) error {
	return Process{Name: name}.Validate()
}

// ErrReasonRequired is returned by operator actions given no reason: the
// audit history must say why an operator intervened.
var ErrReasonRequired = errors.New("an operator action needs a reason")

// Pause sources: who paused a process.
const (
	PauseByOperator = "operator"
	PauseByBreaker  = "breaker"
)
