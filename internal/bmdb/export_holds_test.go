package bmdb

// HoldQueries are the statements of holds and budgets (queries_holds.go),
// for ops_explain_test.go.
var HoldQueries = map[string]string{
	"hold":        qHold,
	"release":     qRelease,
	"holdsOf":     qHoldsOf,
	"holdsList":   qHoldsList,
	"heldCount":   qHeldCount,
	"budgetUsed":  qBudgetUsed,
	"select":      qSelectMachines,
	"escalations": qRecentEscalations,
	"holdsAmong":  qHoldsAmong,
}
