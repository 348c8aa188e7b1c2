/// Whole numbers from doubles and durations, without traps.
///
/// `Int(_:)`, `Int64(_:)` and their kin stop the process when handed a `Double` that is not
/// finite or does not fit, and a JSON number is a double that anyone may write (`1e300`,
/// `-1e19`). So every conversion from a parsed or computed floating-point value, or from a
/// duration, to an integer goes through `init(exactly:)` (for values that must be whole),
/// `init(rounding:_:)` below (for values rounded on purpose), or the `Duration` helpers here,
/// each of which answers nil rather than trapping. A search of the sources for `Int(`,
/// `Int64(`, `UInt64(` and `Int32(` applied to a `Double` or a `Duration` should find nothing
/// else; conversions of C constants and of other integers that always fit stay as they are.
extension FixedWidthInteger {
    /// `value` rounded by `rule`, or nil when that is not finite or does not fit in `Self`.
    public init?(rounding value: Double, _ rule: FloatingPointRoundingRule) {
        guard let whole = Self(exactly: value.rounded(rule)) else { return nil }
        self = whole
    }
}

extension Duration {
    /// The longest duration `Duration.checkedSeconds(_:)` makes: `Int64.max` milliseconds, about
    /// 292 million years (`Duration` itself holds more, but arithmetic on it may then overflow).
    public static let checkedLimitSeconds = Double(Int64.max / 1000)

    /// `seconds` as a duration, to the millisecond (rounded toward zero), or nil when it is not
    /// finite or is longer than `checkedLimitSeconds` either way.
    public static func checkedSeconds(_ seconds: Double) -> Duration? {
        guard seconds.isFinite, abs(seconds) <= checkedLimitSeconds,
            let milliseconds = Int64(rounding: seconds * 1000, .towardZero)
        else { return nil }
        return .milliseconds(milliseconds)
    }

    /// Whole seconds, any fraction counted as a whole second more (toward positive infinity).
    ///
    /// What `expires_in` and `Max-Age` show, so that a token valid for another 0.3 s reads 1,
    /// never 0 (which says "already expired").
    public var secondsRoundedUp: Int64 {
        let (seconds, attoseconds) = components
        guard attoseconds > 0 else { return seconds }
        let (up, overflow) = seconds.addingReportingOverflow(1)
        return overflow ? .max : up
    }

    /// The duration in seconds, with its fraction, for metrics and arithmetic in `Double`.
    public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// Whole milliseconds, rounded toward zero, for logs and C interfaces that count them;
    /// saturates at the ends of `Int64` rather than trapping.
    public var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? .min : .max }
        let (total, overflowAgain) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        return overflowAgain ? (seconds < 0 ? .min : .max) : total
    }
}

extension WallTime {
    /// Whole seconds since 1970 (rounded down), for a JWT's `iat` and `exp`; nil for an instant
    /// outside years 0000–9999 (`RFC3339.writableSeconds`), so that adding a lifetime of up
    /// to a year to it never overflows.
    public var wholeSecondsSince1970: Int64? {
        guard let seconds = Int64(rounding: timeIntervalSince1970, .down), RFC3339.writableSeconds.contains(seconds)
        else { return nil }
        return seconds
    }
}
