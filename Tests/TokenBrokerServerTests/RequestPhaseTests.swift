import Testing

@testable import TokenBrokerServer

/// `RequestPhase` in the one pointer libmicrohttpd keeps per request: each phase reads back as
/// itself, with the same state object, and the context owns exactly one reference to a state.
struct RequestPhaseTests {
    @Test func phasesWithoutStateNeedNoObject() {
        #expect(RequestPhase.awaitingHead.context == nil)
        guard case .awaitingHead = RequestPhase(nil) else {
            Issue.record("a null context is not awaitingHead")
            return
        }
        let headRead = RequestPhase.headRead.context
        #expect(headRead != nil && headRead == RequestPhase.headRead.context, "one constant, not an allocation")
        guard case .headRead = RequestPhase(headRead) else {
            Issue.record("the headRead context reads back as something else")
            return
        }
    }

    @Test func statesReadBackAsTheSameObjectInTheirPhase() {
        let state = RequestState()
        let targetRead = RequestPhase.targetRead(state).context
        let underway = RequestPhase.underway(state).context
        #expect(targetRead != underway)
        guard case .targetRead(let read) = RequestPhase(targetRead), case .underway(let going) = RequestPhase(underway)
        else {
            Issue.record("a state's phase did not read back")
            return
        }
        #expect(read === state && going === state)
        #expect(RequestPhase(targetRead).state === state && RequestPhase(RequestPhase.headRead.context).state == nil)
    }

    @Test func theContextOwnsOneReferenceFromStoringUntilGivenBack() {
        var context: UnsafeMutableRawPointer?
        weak var weakState: RequestState?
        do {
            let state = RequestState()
            weakState = state
            context = RequestPhase.targetRead(state).retainingContext
        }
        #expect(weakState != nil, "the context keeps the state alive")
        // Changing phase keeps the same reference.
        context = RequestPhase.underway(RequestPhase(context).state!).context
        #expect(weakState != nil)
        if let state = RequestPhase(context).state { Unmanaged.passUnretained(state).release() }
        #expect(weakState == nil, "giving the reference back frees the state")
    }

    @Test func attachCreatesAStateOnceAndKeepsIt() {
        var context: UnsafeMutableRawPointer? = RequestPhase.headRead.context
        let first = RequestState.attach(to: &context)
        let second = RequestState.attach(to: &context)
        #expect(first === second)
        guard case .underway(let stored) = RequestPhase(context) else {
            Issue.record("an attached state is not underway")
            return
        }
        #expect(stored === first)
        Unmanaged.passUnretained(first).release()
    }
}
