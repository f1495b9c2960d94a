package bmdb

import "github.com/jackc/pgx/v5"

// Exported for ops_explain_test.go, which checks with EXPLAIN that the
// operator and limit queries read indexes on a fleet-sized database.
var OpsQueries = map[string]string{
	"pause":            qPauseOperator,
	"claimBudget":      qClaimBudget,
	"resume":           qResume,
	"breaker":          qBreakerTrip,
	"limitGauges":      qLimitGauges,
	"backoffClear":     qBackoffClear,
	"retry":            qRetry,
	"leasedOfProcess":  qLeasedOfProcess,
	"backingOff":       qBackingOffOfProcess,
	"rescheduled":      qRescheduledOfProcess,
	"machineResched":   qMachineRescheduled,
	"knownProcesses":   qKnownProcesses,
	"recentFailures":   qRecentFailures,
	"machineTags":      qMachineTags,
	"machineLeases":    qMachineLeases,
	"machineBackoffs":  qMachineBackoffs,
	"machineHistory":   qMachineRecentHistory,
	"machineExists":    qMachineExists,
	"historyOfMachine": qHistoryOfMachine,
	"byProviderID":     qMachinesByProviderID,
	"fleet":            qFleet,
}

// OpsTemplates are the operator queries built from a candidate condition.
var OpsTemplates = map[string]string{
	"eligible":      eligibleTemplate,
	"processCounts": processCountsTemplate,
	"eligibleAmong": eligibleAmongTemplate,
}

// BuildQuery splices c's condition into template and merges args, as the
// BMDB does before running it.
func BuildQuery(template string, c Candidates, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	return spliceCondition(c, template, args)
}

// DueQueries are due-time claiming's two claim statements, for the test
// that interposes a concurrent write between them.
var DueQueries = struct{ Lock, Claim string }{qDueLock, claimDueTemplate}

// EligibleTemplate lists the machines a claim could lease now, evaluated
// over the whole fleet.
const EligibleTemplate = eligibleTemplate
