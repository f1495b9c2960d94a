package bmdb

import "github.com/jackc/pgx/v5"

// Exported for ops_explain_test.go, which checks with EXPLAIN that the
// operator and limit queries read indexes on a fleet-sized database.
var OpsQueries = map[string]string{
	"pause":            operatorSQL("qPauseOperator"),
	"claimBudget":      qClaimBudget,
	"resume":           operatorSQL("qResume"),
	"breaker":          qBreakerTrip,
	"limitGauges":      qLimitGauges,
	"backoffClear":     operatorSQL("qBackoffClear"),
	"retry":            operatorSQL("qRetry"),
	"leasedOfProcess":  operatorSQL("qLeasedOfProcess"),
	"backingOff":       operatorSQL("qBackingOffOfProcess"),
	"rescheduled":      operatorSQL("qRescheduledOfProcess"),
	"machineResched":   operatorSQL("qMachineRescheduled"),
	"knownProcesses":   operatorSQL("qKnownProcesses"),
	"recentFailures":   operatorSQL("qRecentFailures"),
	"machineTags":      operatorSQL("qMachineTags"),
	"machineLeases":    operatorSQL("qMachineLeases"),
	"machineBackoffs":  operatorSQL("qMachineBackoffs"),
	"machineHistory":   operatorSQL("qMachineRecentHistory"),
	"machineExists":    operatorSQL("qMachineExists"),
	"historyOfMachine": qHistoryOfMachine,
	"byProviderID":     operatorSQL("qMachinesByProviderID"),
	"fleet":            operatorSQL("qFleet"),
}

// OpsTemplates are the operator queries built from a candidate condition.
var OpsTemplates = map[string]string{
	"eligible":      operatorSQL("eligibleTemplate"),
	"processCounts": operatorSQL("processCountsTemplate"),
	"eligibleAmong": operatorSQL("eligibleAmongTemplate"),
}

// BuildQuery splices c's condition into template and merges args, as the
// BMDB does before running it.
func BuildQuery(template string, c Candidates, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	return SpliceCondition(c, template, args)
}

// DueQueries are due-time claiming's two claim statements, for the test
// that interposes a concurrent write between them.
var DueQueries = struct{ Lock, Claim string }{qDueLock, claimDueTemplate}

// EligibleTemplate lists the machines a claim could lease now, evaluated
// over the whole fleet.
var EligibleTemplate = operatorSQL("eligibleTemplate")
