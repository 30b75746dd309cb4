package sandbox

import (
	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// action is something done to a sandbox whose outcome its state decides:
// a call of the API or an event (its guest exits, the daemon restarts).
type action string

const (
	actStop        action = "stop"
	actRemove      action = "remove"       // without force
	actForceRemove action = "force remove" // also the timeout's
	actPause       action = "pause"        // also the timeout's, with on_timeout pause
	actIdle        action = "idle"         // auto-pause
	actResume      action = "resume"
	actFreeze      action = "freeze"
	actThaw        action = "thaw"
	// actWake: a call that needs the guest reaches a sandbox that
	// resumes on use (AutoResume).
	actWake     action = "wake"
	actSnapshot action = "snapshot" // also a fork's capture
	actUpdate   action = "update"   // limits
	actPolicy   action = "policy"
	actExit     action = "guest exits" // unexpectedly
	// actRestart and actLost: a new daemon finds the sandbox's guest
	// again, or finds it gone.
	actRestart action = "restart"
	actLost    action = "lost"
)

// step is how an action brings a sandbox to its next state.
type step uint8

const (
	stepNone   step = iota // nothing to do: already so
	stepStart              // start its guest again on its disk
	stepStop               // end its processes (thawed first), keep its disk
	stepFreeze             // stop its processes in place
	stepThaw               // let them run again
	stepRemove             // end its processes now, every other trace in the background
	stepLive               // act on the running guest (freezing it for a capture)
	stepRecord             // change the record only; a start applies it
	stepFail               // record why it ended, release its CPU and memory
	stepAttach             // re-attach to its guest
)

var stepNames = [...]string{"-", "start", "stop", "freeze", "thaw", "remove", "live", "record", "fail", "attach"}

func (s step) String() string { return stepNames[s] }

// move is an action's outcome from one state.
type move struct {
	to   api.State // "" when the sandbox is gone afterwards
	step step
}

// removed is where a sandbox ends: no record, nothing on the host. No
// move leads there directly; a teardown ends there (stateRemoving).
const removed api.State = ""

// stateRemoving is a sandbox whose removal is acknowledged and whose
// teardown (teardown.go) is not finished. It is internal: the record
// keeps it so that a restarted daemon finishes the teardown, but the API
// no longer shows the sandbox (Get answers 404), while its id and uid
// range stay taken.
const stateRemoving api.State = "removing"

// lifecycle is the state machine: what each action does from each state.
// An action missing from a state's row is refused there (an event is
// ignored). The manager consults it for every change of state;
// docs/ARCHITECTURE.md shows it (TestLifecycleTable renders it).
var lifecycle = map[api.State]map[action]move{
	api.StateCreating: {
		actRemove:      {stateRemoving, stepRemove},
		actForceRemove: {stateRemoving, stepRemove},
		actWake:        {api.StateCreating, stepNone},
		// A create the daemon did not finish is removed.
		actRestart: {stateRemoving, stepRemove},
	},
	api.StateRunning: {
		actStop:        {api.StateStopped, stepStop},
		actForceRemove: {stateRemoving, stepRemove},
		actPause:       {api.StatePaused, stepStop},
		actIdle:        {api.StatePaused, stepStop},
		actResume:      {api.StateRunning, stepNone},
		actFreeze:      {api.StateFrozen, stepFreeze},
		actThaw:        {api.StateRunning, stepNone},
		actWake:        {api.StateRunning, stepNone},
		actSnapshot:    {api.StateRunning, stepLive},
		actUpdate:      {api.StateRunning, stepLive},
		actPolicy:      {api.StateRunning, stepLive},
		actExit:        {api.StateFailed, stepFail},
		actRestart:     {api.StateRunning, stepAttach},
		actLost:        {api.StateStopped, stepStop},
	},
	api.StateFrozen: {
		actStop:        {api.StateStopped, stepStop},
		actForceRemove: {stateRemoving, stepRemove},
		actPause:       {api.StatePaused, stepStop},
		actResume:      {api.StateRunning, stepThaw},
		actFreeze:      {api.StateFrozen, stepNone},
		actThaw:        {api.StateRunning, stepThaw},
		actWake:        {api.StateRunning, stepThaw},
		actSnapshot:    {api.StateFrozen, stepNone},
		actUpdate:      {api.StateFrozen, stepLive},
		actPolicy:      {api.StateFrozen, stepLive},
		actExit:        {api.StateFailed, stepFail},
		actRestart:     {api.StateFrozen, stepAttach},
		actLost:        {api.StateStopped, stepStop},
	},
	api.StatePaused: {
		actRemove:      {stateRemoving, stepRemove},
		actForceRemove: {stateRemoving, stepRemove},
		actPause:       {api.StatePaused, stepNone},
		actResume:      {api.StateRunning, stepStart},
		actWake:        {api.StateRunning, stepStart},
		actSnapshot:    {api.StatePaused, stepNone},
		actUpdate:      {api.StatePaused, stepRecord},
		actPolicy:      {api.StatePaused, stepRecord},
		actRestart:     {api.StatePaused, stepNone},
	},
	api.StateStopped: {
		actRemove:      {stateRemoving, stepRemove},
		actForceRemove: {stateRemoving, stepRemove},
		actResume:      {api.StateRunning, stepStart},
		actWake:        {api.StateStopped, stepNone},
		actSnapshot:    {api.StateStopped, stepNone},
		actUpdate:      {api.StateStopped, stepRecord},
		actPolicy:      {api.StateStopped, stepRecord},
		actRestart:     {api.StateStopped, stepNone},
	},
	api.StateFailed: {
		actRemove:      {stateRemoving, stepRemove},
		actForceRemove: {stateRemoving, stepRemove},
		actResume:      {api.StateRunning, stepStart},
		actWake:        {api.StateFailed, stepNone},
		actUpdate:      {api.StateFailed, stepRecord},
		actPolicy:      {api.StateFailed, stepRecord},
		actRestart:     {api.StateFailed, stepNone},
	},
	// The teardown goes on in the background (teardown.go) and ends with
	// the record; a restarted daemon takes it up again.
	stateRemoving: {
		actRemove:      {stateRemoving, stepNone},
		actForceRemove: {stateRemoving, stepNone},
		actRestart:     {stateRemoving, stepRemove},
	},
}

// states and actions order the table's rows and columns.
var (
	states  = []api.State{api.StateCreating, api.StateRunning, api.StateFrozen, api.StatePaused, api.StateStopped, api.StateFailed, stateRemoving}
	actions = []action{actStop, actRemove, actForceRemove, actPause, actIdle, actResume, actFreeze, actThaw, actWake, actSnapshot, actUpdate, actPolicy, actExit, actRestart, actLost}
)

// next returns how act moves b from its state, or why that state refuses
// act (errdefs.ErrConflict).
func next(b *box, act action) (move, error) {
	if mv, ok := lifecycle[b.rec.State][act]; ok {
		return mv, nil
	}
	id, st := b.rec.ID, b.rec.State
	switch act {
	case actStop, actFreeze:
		return move{}, notRunning(b)
	case actRemove:
		return move{}, errdefs.Conflict("sandbox %s is %s; stop it first or force the removal", id, st)
	case actPause:
		return move{}, errdefs.Conflict("sandbox %s is %s; only a running or frozen sandbox can be paused", id, st)
	case actThaw:
		return move{}, errdefs.Conflict("sandbox %s is %s, not frozen", id, st)
	case actSnapshot:
		return move{}, errdefs.Conflict("sandbox %s is %s; it cannot be snapshotted", id, st)
	case actPolicy:
		if st == api.StateCreating {
			return move{}, errdefs.Conflict("sandbox %s is being created", id)
		}
	}
	return move{}, errdefs.Conflict("sandbox %s is %s; it cannot %s", id, st, act)
}
