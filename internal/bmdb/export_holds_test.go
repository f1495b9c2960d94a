package bmdb

// HoldQueries are the statements of holds and budgets (queries_holds.go),
// for ops_explain_test.go.
var HoldQueries = map[string]string{
	"hold":        operatorSQL("qHold"),
	"release":     operatorSQL("qRelease"),
	"holdsOf":     operatorSQL("qHoldsOf"),
	"holdsList":   operatorSQL("qHoldsList"),
	"heldCount":   operatorSQL("qHeldCount"),
	"budgetUsed":  operatorSQL("qBudgetUsed"),
	"select":      operatorSQL("qSelectMachines"),
	"escalations": operatorSQL("qRecentEscalations"),
	"holdsAmong":  operatorSQL("qHoldsAmong"),
}
