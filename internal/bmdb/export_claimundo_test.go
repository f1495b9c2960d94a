package bmdb

import (
	"context"

	"github.com/google/uuid"
)

// UndoClaim is Session.undoClaim, for claim_unanswered_test.go's check of
// its fences.
func (s *Session) UndoClaim(ctx context.Context, process Process, machines []uuid.UUID, xid string) {
	s.undoClaim(ctx, process, machines, xid)
}
