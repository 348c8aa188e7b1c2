// Caller checks of a test's making, whose list never changes.
import TokenBrokerCore

@testable import TokenBrokerAPI

/// A caller check whose list never changes: `admit` decides as `authorize` does, and a caller let
/// in stays let in. (`CallerKeyStore`'s tests change the list under waiting requests.)
protocol FixedCallers: CallerRechecking {}

extension FixedCallers {
    func admit(_ authorization: UnsafeBufferPointer<UInt8>?, provider: String) -> CallerAdmission {
        let decision = authorize(authorization, provider: provider)
        guard decision == .allowed else { return .refused(decision) }
        return .allowed(AdmittedCaller(keyDigest: [], provider: provider, list: 0))
    }

    func recheck(_ caller: AdmittedCaller) -> CallerDecision { .allowed }
}
